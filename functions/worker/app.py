"""Worker Lambda: one map item (a few consecutive parts of one staging segment).

Event (built by the map's ItemSelector): {"backup": "NAME@ID", "prefix": ...,
"repository": <repository id>, "level": 3, "item": <MapItem JSON>}.
Returns: null. The chunk entries go to the item's result record in S3, so no
result list crosses the state payload limit.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from braid.adapters.aws.lambda_env import key_service, repository_store, worker_lanes
from braid.errors import UsageError
from braid.format.ids import BackupRef
from braid.pipeline.plan import MapItem
from braid.pipeline.worker import ChunkLanes, DataKeyCache, process_item

logger = Logger()
tracer = Tracer()
metrics = Metrics()

# Per container, reused across invocations: one KMS Decrypt per backup, and
# codecs whose large output buffers are allocated once.
_keys: DataKeyCache | None = None
_lanes: ChunkLanes | None = None


def _container() -> tuple[DataKeyCache, ChunkLanes]:
    global _keys, _lanes
    if _keys is None or _lanes is None:
        _keys = DataKeyCache(key_service())
        _lanes = ChunkLanes(worker_lanes())
    return _keys, _lanes


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> None:
    try:
        ref = BackupRef.parse(str(event["backup"]))
        prefix, repository, level = str(event.get("prefix", "")), str(event["repository"]), int(event["level"])
        item = MapItem.from_json(event["item"])
    except (KeyError, TypeError, ValueError) as exc:
        raise UsageError(f"invalid worker event: {exc}") from None
    logger.append_keys(backup=str(ref), first_index=item.first_index, chunks=item.count)
    keys, lanes = _container()
    store = repository_store(prefix)
    key, _ = keys.get(store, ref, repository)
    outcome = process_item(store, ref, item, key=key, level=level, lanes=lanes)
    metrics.add_metric(name="BytesIn", unit=MetricUnit.Bytes, value=outcome.bytes_in)
    metrics.add_metric(name="BytesOut", unit=MetricUnit.Bytes, value=outcome.bytes_out)
    metrics.add_metric(name="CompressionRatio", unit=MetricUnit.NoUnit, value=round(outcome.ratio, 4))
    metrics.add_metric(name="SecondsPerChunk", unit=MetricUnit.Seconds, value=round(outcome.seconds_per_chunk, 4))
    metrics.add_metric(name="ChunksStored", unit=MetricUnit.Count, value=len(outcome.result.entries))
    logger.info("item stored", extra={"bytes_in": outcome.bytes_in, "bytes_out": outcome.bytes_out, "seconds": round(outcome.seconds, 3)})
    return None
