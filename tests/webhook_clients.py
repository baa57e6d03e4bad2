"""Signs and verifies webhook requests with the svix and standardwebhooks
Python libraries' own code, for tests/serve_auth.rs, which sends each
request to `serve` and checks that it decides as these libraries do.

Reads a JSON list of cases on stdin; each case is an object with
    id          the message id to sign
    timestamp   Unix seconds to sign (and send)
    signed      the body the signatures are made over
    sent        the body that is sent (differs when tampered)
    sign_with   secrets (whsec_...) whose signatures the header lists
    verify_with the receiver's secrets: a library accepts when it accepts
                under any one of them
    names       "webhook" (webhook-id, ...), "svix" (svix-id, ...) or
                "both" (each header under both names)
Writes a JSON list with, per case,
    headers     the request's signature headers, as name -> value
    svix        null when svix.webhooks.Webhook.verify accepts, else its error
    standard    the same for standardwebhooks.Webhook.verify (which reads
                only the webhook-* names)
"""

import json
import sys
from datetime import datetime, timezone

import standardwebhooks
import svix.webhooks

NAMES = {
    "webhook": [("webhook-id", "webhook-timestamp", "webhook-signature")],
    "svix": [("svix-id", "svix-timestamp", "svix-signature")],
    "both": [
        ("webhook-id", "webhook-timestamp", "webhook-signature"),
        ("svix-id", "svix-timestamp", "svix-signature"),
    ],
}


def verdict(make, secrets, body, headers):
    """None when the library's verifier accepts under one of `secrets`,
    else the last error message it gave."""
    error = None
    for secret in secrets:
        try:
            make(secret).verify(body, dict(headers))
            return None
        except Exception as e:  # the libraries raise WebhookVerificationError
            error = f"{type(e).__name__}: {e}"
    return error


def run(case):
    sent_at = datetime.fromtimestamp(case["timestamp"], tz=timezone.utc)
    signatures = " ".join(
        svix.webhooks.Webhook(secret).sign(case["id"], sent_at, case["signed"])
        for secret in case["sign_with"]
    )
    headers = {}
    for id_name, timestamp_name, signature_name in NAMES[case["names"]]:
        headers[id_name] = case["id"]
        headers[timestamp_name] = str(case["timestamp"])
        headers[signature_name] = signatures
    body = case["sent"]
    return {
        "headers": headers,
        "svix": verdict(svix.webhooks.Webhook, case["verify_with"], body, headers),
        "standard": verdict(_Standard, case["verify_with"], body, headers),
    }


class _Standard:
    """standardwebhooks.Webhook whose verify(body, headers) judges the
    signature only (json_parse=False: the body need not be JSON)."""

    def __init__(self, secret):
        self.inner = standardwebhooks.Webhook(secret)

    def verify(self, body, headers):
        self.inner.verify(body, headers, json_parse=False)


if __name__ == "__main__":
    json.dump([run(case) for case in json.load(sys.stdin)], sys.stdout)
