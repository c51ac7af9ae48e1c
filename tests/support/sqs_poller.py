"""Lambda's SQS event source mapping, in the emulator: poll a queue, invoke the function with batches.

As AWS documents it (Lambda developer guide, "Using Lambda with Amazon
SQS"): the poller long-polls the queue, gathers up to BatchSize messages
or until MaximumBatchingWindowInSeconds passed since the first, invokes
the function synchronously with `{"Records": [...]}` and deletes the
messages it processed. With ReportBatchItemFailures, the messages the
function names in `batchItemFailures` stay on the queue; a function error
leaves every message of the batch. Messages left become visible again after
the queue's visibility timeout, and SQS (moto) moves one received more than
the redrive policy's maxReceiveCount times to the dead-letter queue.

Emulator-only knobs: the batching window is divided by --time-scale, and a
message left on the queue is made visible again after `redelivery` seconds
(--sqs-redelivery; default: the queue's visibility timeout, as on AWS), so
tests see a retry without waiting twelve minutes.

moto's own event source mapping is not used: it invokes the function inside
the SendMessage that S3's notification makes (so inside the host's PUT),
one message at a time, and ignores batchItemFailures.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

log = logging.getLogger("emulated-aws.sqs")


class SqsPoller:
    def __init__(self, session: Any, source: dict[str, Any], *, time_scale: float = 1.0, redelivery: float | None = None) -> None:
        self.sqs = session.client("sqs")
        self.lambda_ = session.client("lambda")
        self.source = source
        self.window = float(source["window"]) / time_scale
        self.redelivery = int(round(redelivery if redelivery is not None else source["visibility"]))
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"sqs-poller-{source['function']}", daemon=True)
        self.invocations = 0

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)

    def _receive(self, wanted: int, wait: int) -> list[dict[str, Any]]:
        response = self.sqs.receive_message(
            QueueUrl=self.source["queue_url"], MaxNumberOfMessages=min(10, wanted), WaitTimeSeconds=wait, AttributeNames=["All"]
        )
        return list(response.get("Messages") or [])

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                batch = self._receive(self.source["batch_size"], 1)
                if not batch:
                    continue
                deadline = time.monotonic() + self.window
                while len(batch) < self.source["batch_size"] and time.monotonic() < deadline and not self.stop.is_set():
                    batch += self._receive(self.source["batch_size"] - len(batch), 0) or []
                    if len(batch) < self.source["batch_size"]:
                        self.stop.wait(min(0.1, max(0.0, deadline - time.monotonic())))
                self._invoke(batch)
            except Exception:  # the poller outlives a failed call, as Lambda's does
                log.exception("SQS poller for %s", self.source["function"])
                self.stop.wait(0.5)

    def _invoke(self, batch: list[dict[str, Any]]) -> None:
        records = [
            {
                "messageId": m["MessageId"],
                "receiptHandle": m["ReceiptHandle"],
                "body": m["Body"],
                "attributes": m.get("Attributes", {}),
                "messageAttributes": {},
                "md5OfBody": m.get("MD5OfBody", ""),
                "eventSource": "aws:sqs",
                "eventSourceARN": self.source["queue_arn"],
                "awsRegion": self.source["queue_arn"].split(":")[3],
            }
            for m in batch
        ]
        self.invocations += 1
        response = self.lambda_.invoke(FunctionName=self.source["function"], Payload=json.dumps({"Records": records}).encode())
        payload = response["Payload"].read()
        if response.get("FunctionError"):
            failed = {m["MessageId"] for m in batch}
            log.info("%s failed its batch of %d: %s", self.source["function"], len(batch), payload[:300])
        elif self.source["partial"]:
            result = json.loads(payload or b"null") or {}
            failed = {str(item["itemIdentifier"]) for item in result.get("batchItemFailures") or []}
        else:
            failed = set()
        for message in batch:
            if message["MessageId"] in failed:
                self.sqs.change_message_visibility(
                    QueueUrl=self.source["queue_url"], ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=self.redelivery
                )
            else:
                self.sqs.delete_message(QueueUrl=self.source["queue_url"], ReceiptHandle=message["ReceiptHandle"])
