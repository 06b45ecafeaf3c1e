"""Tags each input with a user-config value and publishes it with context.publish."""

from pulsar import Function


class PublishTagged(Function):
    def process(self, input, context):
        tag = context.get_user_config_value("tag") or "untagged"
        topic = context.get_user_config_value("publish-topic")
        context.publish(topic, f"{tag}:{input}")
        return None
