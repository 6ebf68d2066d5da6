"""Sans-IO MQTT 3.1, 3.1.1 and 5.0: packets, codec, properties, topic rules.

Pure Python and the standard library only: no I/O, no Twisted, no logging, no
global mutable state (ARCHITECTURE.md section 3).
"""

from .codec import (
    Decoder, MalformedPacket, encode, encode_puback, encode_pubacks, encode_publish, encode_pubrec,
    publish_packet_id_offset,
)
from .constants import (
    MQTT_3_1,
    MQTT_3_1_1,
    MQTT_5,
    PROPERTY_PACKET_TYPES,
    PROPERTY_TYPES,
    REASON_CODES,
    WILL_PROPERTIES,
    ConnackReturnCode,
    PacketType,
    Property,
    PropertyType,
    ReasonCode,
    SubackReturnCode,
    connack_return_code,
    is_failure,
)
from .packets import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    SubscriptionRequest,
    Unsuback,
    Unsubscribe,
    Will,
)
from .properties import decode_properties, encode_properties, pack_properties, unpack_properties
from .topics import (
    TopicError,
    parse_shared_subscription,
    topic_matches,
    validate_topic_filter,
    validate_topic_name,
)

__all__ = [
    # constants
    "PacketType",
    "MQTT_3_1",
    "MQTT_3_1_1",
    "MQTT_5",
    "ReasonCode",
    "ConnackReturnCode",
    "SubackReturnCode",
    "connack_return_code",
    "is_failure",
    "Property",
    "PropertyType",
    "PROPERTY_TYPES",
    "PROPERTY_PACKET_TYPES",
    "REASON_CODES",
    "WILL_PROPERTIES",
    # packets
    "Will",
    "Connect",
    "Connack",
    "Publish",
    "Puback",
    "Pubrec",
    "Pubrel",
    "Pubcomp",
    "SubscriptionRequest",
    "Subscribe",
    "Suback",
    "Unsubscribe",
    "Unsuback",
    "Pingreq",
    "Pingresp",
    "Disconnect",
    "Auth",
    "Packet",
    # properties
    "encode_properties",
    "decode_properties",
    "pack_properties",
    "unpack_properties",
    # codec
    "MalformedPacket",
    "encode",
    "encode_publish",
    "encode_puback",
    "encode_pubacks",
    "encode_pubrec",
    "publish_packet_id_offset",
    "Decoder",
    # topics
    "TopicError",
    "validate_topic_name",
    "validate_topic_filter",
    "parse_shared_subscription",
    "topic_matches",
]
