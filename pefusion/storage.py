"""What a storage URI may show, and what names it: the one home of both.

A URI's user information (`s3://KEY:SECRET@bucket/path`, the one place pyarrow takes credentials in a URI; an
`http://user:password@host` tracking URI likewise) is a secret: whatever the project prints, logs or records in
MLflow passes through `redact`, which puts `***` in its place. A command line that must still run (the printed
--resume command) leaves it out instead (`without_credentials`): the store's client then reads the credentials
from the environment (`AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` for S3), which `credentials_note` says.

A sweep's storage is *named* by `canonical`: scheme, bucket (or folder) and path, without the endpoint's spelling
(`?endpoint_override=...` or `AWS_ENDPOINT_URL`), the query's other options or credentials, so that the same
experiment reached another way is the same sweep (one MLflow parent run).
"""
from __future__ import annotations

import re

# scheme://userinfo@ : the user information of a URI anywhere in a line (up to the first '/', '@' or space)
_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)([^/@\s'\"?#]+)@")
REDACTED = "***"


def redact(text: str) -> str:
    """`text` with the user information of every URI in it replaced by `***`."""
    return _USERINFO.sub(rf"\1{REDACTED}@", text)


def without_credentials(text: str) -> str:
    """`text` with the user information of every URI in it left out (a redacted one too)."""
    return _USERINFO.sub(r"\1", text)


def has_credentials(text: str) -> bool:
    return _USERINFO.search(text) is not None


def credentials_note(uri: str) -> str:
    """Where the credentials of `uri` come from once its user information is left out: '' when it had none."""
    if not has_credentials(uri):
        return ""
    if uri.lower().startswith("s3://"):
        return ("the storage URI's credentials are not printed: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                "in the environment (or your AWS profile) before running it")
    return "the storage URI's credentials are not printed: give them to its client through the environment"


def canonical(path: str) -> str:
    """The storage's name, the same however it is reached: for a URI its scheme (lower case), bucket and path
    (no credentials, no query, no trailing or doubled '/'); a local path as it is."""
    if "://" not in path:
        return path.rstrip("/") or "/"
    scheme, rest = path.split("://", 1)
    rest = without_credentials(f"x://{rest}")[len("x://"):].split("?", 1)[0].split("#", 1)[0]
    return f"{scheme.lower()}://" + "/".join(part for part in rest.split("/") if part)


def path_name(path: str) -> str:
    """The last part of an experiment's path or URI (its query left out): the experiment's name."""
    return (path.split("?", 1)[0] if "://" in path else path).rstrip("/").rsplit("/", 1)[-1]
