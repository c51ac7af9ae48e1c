"""Worker Lambda: one map item (a few consecutive parts of one staging segment).

Event (built by the map's ItemSelector): {"backup": "NAME@ID", "prefix": ...,
"repository": <repository id>, "level": 3, "item": <MapItem JSON>}.
Returns: null. The chunk entries go to the item's result record in S3, so no
result list crosses the state payload limit, with the invocation's usage
(its requests and billed duration, braid.pipeline.usage).
"""

from __future__ import annotations

from typing import Any

from braid.adapters.aws.lambda_env import key_service, repository_store, worker_lanes
from braid.pipeline.observability import LambdaContext, MetricUnit, add_metrics, logger, memory_mb, pipeline_handler
from braid.pipeline.usage import WORKER
from braid.pipeline.worker import ChunkLanes, DataKeyCache, WorkerEvent, process_item
from braid.ports.usage import metering

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


@pipeline_handler
def handler(event: dict[str, Any], context: LambdaContext) -> None:
    with metering(WORKER, memory_mb(context)) as meter:  # its requests and duration go into the item's result record
        request = WorkerEvent.from_event(event)
        logger.append_keys(first_index=request.item.first_index, chunks=request.item.count)
        keys, lanes = _container()
        store = repository_store(request.prefix)
        key, _ = keys.get(store, request.ref, request.repository)
        outcome = process_item(store, request.ref, request.item, key=key, level=request.level, lanes=lanes, meter=meter)
    add_metrics(
        {
            "BytesIn": (MetricUnit.Bytes, outcome.bytes_in),
            "BytesOut": (MetricUnit.Bytes, outcome.bytes_out),
            "CompressionRatio": (MetricUnit.NoUnit, round(outcome.ratio, 4)),
            "SecondsPerChunk": (MetricUnit.Seconds, round(outcome.seconds_per_chunk, 4)),
            "ChunksStored": (MetricUnit.Count, len(outcome.result.entries)),
        }
    )
    logger.info("item stored", extra={"bytes_in": outcome.bytes_in, "bytes_out": outcome.bytes_out, "seconds": round(outcome.seconds, 3)})
    return None
