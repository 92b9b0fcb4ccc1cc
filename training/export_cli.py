"""`cdt export CHECKPOINT --out models/NAME/`: the ONNX policy plus its model card.

The arguments are parsed and checked here, apart from the exporter (`export.py`), so that
`--help` and a mistake answer at once: the exporter imports torch and onnx (~2 s).
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import tyro

from runtime.files import CARD_FILE, ONNX_FILE, check_writable, refuse_overwrite
from runtime.user_errors import UserError, exit_on_user_errors
from training.tyro_cli import parse


@dataclass(frozen=True)
class ExportArgs:
    """Export a training checkpoint as an ONNX policy with its model card."""

    checkpoint: Annotated[Path, tyro.conf.Positional]
    """Checkpoint written by `cdt train` (e.g. runs/NAME/last.pt or best.pt)."""
    out: Path
    """Output folder, e.g. models/my-carrun/ (created if missing)."""
    force: bool = False
    """replace the model in `out` when it holds one already (a shipped model, say)."""
    name: str | None = None
    """Model name in the card; defaults to the output folder's name."""
    version: str | None = None
    """Version string in the card; defaults to `<date>.<training step>`."""


def check_export(args: ExportArgs) -> None:
    """Before any work: the checkpoint is there, the folder writable, no model replaced unasked."""
    if not args.checkpoint.is_file():
        raise UserError(f"{args.checkpoint}: no such checkpoint")
    check_writable(args.out, folder=True, option="--out")
    hint = "export to another --out, or pass --force to replace that model"
    refuse_overwrite([args.out / ONNX_FILE, args.out / CARD_FILE], args.force, hint)


@exit_on_user_errors("cdt export", "training.checkpoint.CheckpointError")
def main(argv: list[str] | None = None) -> None:
    """`cdt export CHECKPOINT --out models/NAME/`."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("training").setLevel(logging.INFO)
    args = parse(ExportArgs, sys.argv[1:] if argv is None else argv, "cdt export")
    check_export(args)
    # Imported after parsing: the exporter loads torch and onnx (~2 s), which --help never needs.
    from training.export import export_checkpoint, quiet_exporter_logs

    quiet_exporter_logs()
    out_dir = export_checkpoint(args.checkpoint, args.out, args.name, args.version)
    print(f"exported: {out_dir / ONNX_FILE} and {out_dir / CARD_FILE}")


if __name__ == "__main__":
    main()
