"""`cdt collect`: build an offline safe-RL dataset with PPO-Lagrangian and a rising cost threshold.

Here: the command, which checks the outputs before the first epoch; the settings are
`settings.py`'s, the run is `collection.py`'s, imported after parsing.
"""

from __future__ import annotations

import logging

from runtime.files import check_writable, refuse_overwrite
from runtime.sim import check_task
from runtime.user_errors import exit_on_user_errors
from training.collect.settings import CollectConfig, check_resume, output_paths
from training.run_lock import run_folder_lock
from training.tyro_cli import parse


def check_before_collecting(config: CollectConfig) -> None:
    """The task exists, the outputs may be written (none replaced without --force) and a run
    folder that holds epochs already is continued with their settings."""
    check_task(config.task)  # an unknown task: `UnknownTask`, a one-line UserError
    check_writable(config.output_path, option="--out")
    hint = "give another --out, or pass --force to replace it"
    refuse_overwrite(output_paths(config), config.force, hint)
    check_writable(config.run_path, folder=True, option="--run-dir")
    check_resume(config)


@exit_on_user_errors("cdt collect")
def main(argv: list[str] | None = None) -> None:
    """Entry point of `cdt collect`."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    config = parse(CollectConfig, argv, "cdt collect")
    check_before_collecting(config)
    # Imported after parsing: the run loads torch and the simulator (~2 s); --help needs neither.
    from training.collect.collection import finalize, learn

    with run_folder_lock(config.run_path, "cdt collect"):
        if not config.finalize_only:
            learn(config)
        path = finalize(config)
    print(f"dataset written: {path}")


if __name__ == "__main__":
    main()
