"""``mtc state check|backup|restore``: the embedded state directory as an operator handles it
(``shared.adapters.state_files``). Backup is online (sqlite's backup API); restore wants no
server running over the directory."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from services.cli.client import ClientError
from shared.adapters import state_files


def cmd_state(args: argparse.Namespace, state_dir: Path) -> None:
    match args.action:
        case "check":
            found = state_files.check(state_dir)
            if args.json:
                print(json.dumps({"stateDir": str(state_dir), "ok": not found,
                                  "findings": [{"path": str(f.path), "problem": f.problem}
                                               for f in found]}, indent=2))
            for finding in found if not args.json else ():
                print(finding)
            if found:
                raise ClientError("FAILED_PRECONDITION", f"{len(found)} problem(s) in "
                                  f"{state_dir}; " + state_files.RECOVERY.format(dir=state_dir))
            if not args.json:
                dbs = [d for d in state_files.databases(state_dir) if d.exists()]
                print(f"{state_dir}: ok ({len(dbs)} database(s) pass their integrity check "
                      "and the files agree)" if dbs else f"{state_dir}: no state yet")
        case "backup":
            written = state_files.backup(state_dir, Path(args.dest))
            print(f"backed up {len(written)} file(s) of {state_dir} into {args.dest}")
        case "restore":
            try:
                restored = state_files.restore(Path(args.source), state_dir)
            except (FileNotFoundError, ValueError) as exc:
                raise ClientError("FAILED_PRECONDITION", str(exc)) from exc
            print(f"restored {len(restored)} file(s) into {state_dir} (the replaced ones are "
                  "kept as *.damaged)")
