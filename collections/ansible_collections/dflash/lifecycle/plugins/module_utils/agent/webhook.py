# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The supervisor's webhook events, signed so that no CT can post another's (Python 3.8 compatible,
the standard library only; docs/security.md, "Webhook events").

A CT's root can post anything to the webhook's URL, which every CT of the inventory is given. So
each CT signs its events with a key of its own, as GitHub's and Stripe's webhooks sign theirs:
the key is derived on the controller from the team's secret (``trainer_launch_supervise_webhook_secret``,
from a vault) and the CT's inventory name, and only that CT is given it. A receiver that holds the
team's secret derives the key of the CT the event names, and takes the event only when the
signature matches and the body names that CT: one CT's key signs nothing for another, and no CT
learns the team's secret.

    X-Dflash-CT: ct200
    X-Dflash-Timestamp: 1765000000
    X-Dflash-Signature: sha256=<hex HMAC-SHA256(key, "<timestamp>." + body)>
    key = hex HMAC-SHA256(team secret, "dflash-lifecycle webhook\\0" + CT name)
"""

from __future__ import annotations

import hashlib
import hmac

KEY_CONTEXT = b"dflash-lifecycle webhook\0"


def derived_key(secret, ct):
    """The key CT ct signs its events with, from the team's secret (hex: it travels as text)."""
    return hmac.new(secret.encode(), KEY_CONTEXT + ct.encode(), hashlib.sha256).hexdigest()


def signed_headers(ct, key, body, now):
    """The headers of an event body (bytes) that CT ct signs with its key at time now."""
    timestamp = str(int(now))
    signature = hmac.new(key.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return {"X-Dflash-CT": ct, "X-Dflash-Timestamp": timestamp, "X-Dflash-Signature": f"sha256={signature}"}
