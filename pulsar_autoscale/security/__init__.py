"""Security of our HTTP servers: Pulsar-compatible tokens, authorization, TLS, redaction (docs/security.md)."""
