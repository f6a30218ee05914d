"""The twin's results in a run directory (``mtc sim run --out DIR`` / ``mtc sim sweep``):
its plots (PNG) and tables (CSV, JSON), listed and read with bounds, never outside DIR."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from services.api.errors import ApiError, invalid

KINDS = {".png": "plot", ".csv": "table", ".json": "table"}
MAX_FILES = 200
MAX_DEPTH = 4
MAX_BYTES = 8 << 20  # a file the console reads
MAX_ROWS = 200


def listing(root: Path) -> dict[str, Any]:
    """The plots and tables under ``root`` (at most MAX_FILES, MAX_DEPTH levels down)."""
    files: list[dict[str, Any]] = []
    more = False
    if root.is_dir():
        for path in sorted(root.rglob("*")):
            rel = path.relative_to(root)
            if len(rel.parts) > MAX_DEPTH or path.suffix not in KINDS or not path.is_file() \
                    or path.is_symlink():
                continue
            if len(files) >= MAX_FILES:
                more = True
                break
            files.append({"path": rel.as_posix(), "kind": KINDS[path.suffix],
                          "bytes": path.stat().st_size})
    return {"dir": str(root), "files": files, "more": more}


def resolve(root: Path, rel: str) -> Path:
    """``rel`` inside ``root``: a listed kind of file, no '..', no link out; else a 400/404."""
    if not rel or rel.startswith("/") or "\\" in rel or "\x00" in rel \
            or any(p in ("", ".", "..") for p in rel.split("/")):
        raise invalid("path", "must be a relative path inside the run directory")
    path = root / rel
    if path.suffix not in KINDS:
        raise invalid("path", f"must name a {', '.join(KINDS)} file")
    try:
        real = path.resolve(strict=True)
        real.relative_to(root.resolve())
    except (OSError, ValueError):
        raise ApiError("NOT_FOUND", f"no file {rel} in the run directory") from None
    if not real.is_file():
        raise ApiError("NOT_FOUND", f"no file {rel} in the run directory")
    if real.stat().st_size > MAX_BYTES:
        raise ApiError("FAILED_PRECONDITION", f"{rel} is larger than {MAX_BYTES} bytes")
    return real


def _flat(value: Any, prefix: str = "", out: list[list[str]] | None = None) -> list[list[str]]:
    out = [] if out is None else out
    if isinstance(value, dict):
        for k, v in value.items():
            _flat(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(value, list) and len(value) <= 20 and all(
            not isinstance(v, dict | list) for v in value):
        out.append([prefix, ", ".join(str(v) for v in value)])
    elif isinstance(value, float):
        out.append([prefix, f"{value:.4g}"])
    else:
        out.append([prefix, json.dumps(value) if isinstance(value, list) else str(value)])
    return out


def table(path: Path) -> dict[str, Any]:
    """A CSV as header and rows; a JSON document as key/value rows; at most MAX_ROWS."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix == ".csv":
        rows = list(csv.reader(text.splitlines()))
        header, body = (rows[0], rows[1:]) if rows else ([], [])
    else:
        try:
            doc = json.loads(text)
        except (json.JSONDecodeError, RecursionError):
            raise ApiError("FAILED_PRECONDITION", f"{path.name} is not JSON") from None
        if isinstance(doc, list) and doc and all(isinstance(r, dict) for r in doc):
            header = list(dict.fromkeys(k for r in doc for k in r))
            body = [[str(r.get(k, "")) for k in header] for r in doc]
        else:
            header, body = ["key", "value"], _flat(doc)
    return {"header": header, "rows": [r[:50] for r in body[:MAX_ROWS]],
            "total": len(body), "truncated": len(body) > MAX_ROWS}
