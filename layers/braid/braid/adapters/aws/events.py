"""EventPublisher over Amazon EventBridge: outcome events people and automation react to."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from braid import contract
from braid.adapters.aws.errors import AwsCall, aws_error
from braid.errors import StorageError

if TYPE_CHECKING:  # the stubs are a development dependency: the Lambda layer does not ship them
    from types_boto3_events.client import EventBridgeClient
    from types_boto3_events.type_defs import PutEventsRequestEntryTypeDef


class EventBridgePublisher:
    """Puts one event per outcome on a bus, from the source contract.EVENT_SOURCE."""

    def __init__(self, client: EventBridgeClient, bus: str) -> None:
        self.client = client
        self.bus = bus

    def publish(self, detail_type: str, detail: Mapping[str, Any]) -> None:
        entry: PutEventsRequestEntryTypeDef = {"Source": contract.EVENT_SOURCE, "DetailType": detail_type, "Detail": json.dumps(dict(detail)), "EventBusName": self.bus}
        try:
            response = self.client.put_events(Entries=[entry])
        except (ClientError, BotoCoreError) as exc:
            call = AwsCall("EventBridge", f"publishing {detail_type!r} to bus {self.bus}", "events:PutEvents")
            raise aws_error(exc, call, StorageError) from None
        if response.get("FailedEntryCount"):
            failed = response["Entries"][0]
            raise StorageError(f"EventBridge refused {detail_type!r}: {failed.get('ErrorCode')}: {failed.get('ErrorMessage')}")
