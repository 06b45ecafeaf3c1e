"""Telling a standalone whose bookie lost its registration during startup (worth starting again) from any other
startup failure (reported as it is)."""

from pulsar_autoscale.broker.apache import registration_lost

# Lines of a standalone started again 2 s after a kill -9 over the same data, which then exited during startup.
LOST = """\
2026-11-29T06:47:22,463+0000 [metadata-store-1-1] INFO  org.apache.pulsar.metadata.coordination.impl.ResourceLockImpl - Successfully revalidated the lock on /ledgers/available/127.0.0.1:40459
2026-11-29T06:47:22,464+0000 [metadata-store-1-1] INFO  org.apache.pulsar.metadata.coordination.impl.ResourceLockImpl - Lock on resource /ledgers/available/127.0.0.1:40459 was invalidated. state Valid
2026-11-29T06:47:22,464+0000 [metadata-store-1-1] INFO  org.apache.pulsar.metadata.impl.AbstractMetadataStore - Deleting path: /ledgers/available/127.0.0.1:40459 (v. Optional[0])
Exception: java.lang.IllegalThreadStateException thrown from the UncaughtExceptionHandler in thread "BookieDeathWatcher-40459"
"""


def test_a_bookie_registration_deleted_under_it_is_recognised():
    assert registration_lost(LOST)


def test_other_startup_failures_are_not():
    assert not registration_lost("java.net.BindException: Address already in use\n")
    # a lock on another resource, or the bookie's registration revalidated without being lost
    assert not registration_lost("Lock on resource /admin/leader was invalidated. state Valid\n")
    assert not registration_lost(LOST.splitlines()[0])
