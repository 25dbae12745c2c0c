"""A campaign as a Ray job: the metadata the dashboard's Jobs page shows for it, and how a person reaches
that page.

`qkvsearch launch` run directly is a driver job: its metadata goes in through `ray.init(job_config=...)`.
Under `ray job submit -- qkvsearch launch ...` the Jobs page lists the submission, whose metadata Ray
keeps apart from the driver's; the driver adds the campaign's metadata to the submission's record.
Every key starts with `qkvsearch_`, so a job's own metadata (`--metadata-json`) is never overwritten.
"""
from __future__ import annotations

import json
import logging
import os

from qkvsearch import ray_private
from qkvsearch.spaces.errors import reason

log = logging.getLogger(__name__)

METADATA_PREFIX = "qkvsearch_"
# Where a submitted job's driver finds its submission (Ray's job supervisor sets it: runtime_env, metadata).
_SUBMITTED_JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"
_SUBMISSION_ID_KEY = "job_submission_id"
_JOB_NAME_KEY = "job_name"  # the Jobs page's Name column


def job_metadata(campaign, num_trials: int, code_version: str) -> dict[str, str]:
    """Jobs-page metadata of a campaign (Ray keeps str -> str): name, spec, results, code, trials. campaign: its
    ``spec`` (a CampaignSpec) and ``exp`` (its folder), as the campaign layer opens it."""
    spec = campaign.spec
    return {
        f"{METADATA_PREFIX}campaign": spec.name,
        f"{METADATA_PREFIX}spec": json.dumps(spec.to_dict(), sort_keys=True, separators=(",", ":")),
        f"{METADATA_PREFIX}results": campaign.exp,
        f"{METADATA_PREFIX}code_version": code_version,
        f"{METADATA_PREFIX}trials": str(num_trials),
    }


def job_config(metadata: dict[str, str]):
    """A driver job's config: the campaign's metadata, and its name in the Jobs page's Name column (a
    submitted job keeps the name it was submitted with: Ray prefers the submission's metadata)."""
    from ray.job_config import JobConfig

    name = metadata.get(f"{METADATA_PREFIX}campaign")
    return JobConfig(metadata={**({_JOB_NAME_KEY: name} if name else {}), **metadata})


def submission_id() -> str | None:
    """The submission this driver runs under (`ray job submit`), or None for a driver started by hand."""
    try:
        config = json.loads(os.environ.get(_SUBMITTED_JOB_CONFIG_ENV) or "{}")
    except ValueError:
        return None
    return (config.get("metadata") or {}).get(_SUBMISSION_ID_KEY)


def tag_submission(metadata: dict[str, str]) -> bool:
    """Add the campaign's metadata to the submission's record, which the Jobs page lists. -> done?

    Ray's job supervisor reads that record before each status update and writes it back whole, so the
    keys added here stay. A failure is logged and ignored: the campaign runs either way.
    """
    sid = submission_id()
    if not sid:
        return False
    try:
        return ray_private.add_job_metadata(sid, metadata)
    except Exception as exc:  # noqa: BLE001  (Ray's internal layout may move; the campaign must not)
        log.warning(f"the campaign's metadata could not be added to job {sid}: {reason(exc)}")
        return False


def dashboard_lines(url: str | None) -> list[str]:
    """Where the dashboard is and how to sign in; never the token itself."""
    if not url:
        return ["Ray dashboard: not running on this cluster"]
    address = url if url.startswith("http") else f"http://{url}"
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        return [f"Ray dashboard: {address} (token auth disabled by RAY_AUTH_MODE)"]
    where = os.environ.get("RAY_AUTH_TOKEN_PATH") or "~/.ray/auth_token"
    return [f"Ray dashboard: {address} (sign in with the token `ray get-auth-token` prints, kept in {where}; "
            f"HTTP clients send 'Authorization: Bearer <token>')"]
