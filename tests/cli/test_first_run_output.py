"""A first run of the quickstart prints what the user needs: no dependency's tip, warning or deprecation notice."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).parents[2]

# What a first run printed before: each came from how lightning_fed called Lightning, W&B or torch.
NOTICES = {
    "Lightning's litlogger tip": "litlogger",
    "W&B's anonymous warning": "The anonymous setting has no effect",
    "W&B's git root warning": "git root ",
    "torch's LeafSpec deprecation, from Lightning": "LeafSpec",
}


def test_quickstart_first_run_prints_no_dependency_notices(tmp_path):
    # A user without a W&B account, in a fresh directory: no W&B settings, credentials or silencing from the tests.
    env = {key: value for key, value in os.environ.items() if not key.startswith("WANDB_")}
    (tmp_path / "netrc").write_text("")
    env.update(HOME=str(tmp_path), NETRC=str(tmp_path / "netrc"), PYTHONPATH=str(REPO))
    command = [
        *(sys.executable, "-m", "lightning_fed.cli.main", "fit", "--config", str(REPO / "configs" / "quickstart.yaml")),
        *("--trainer.num_rounds", "1", "--trainer.local_epochs", "1", "--data.init_args.num_samples", "1000"),
    ]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    printed = {name: line for name, text in NOTICES.items() for line in output.splitlines() if text in line}
    assert printed == {}, output
    assert "[lightning_fed] final after 1 rounds: global/test_acc=" in done.stdout
    assert "[lightning_fed] run directory: runs/quickstart/runs/" in done.stdout
    assert list((tmp_path / "runs" / "quickstart" / "runs").glob("*/wandb/offline-run-*"))


SCRIPT = """
import sys
from helpers.boring import BoringClassifier, fast_trainer, make_datamodule

trainer = fast_trainer(sys.argv[1])
module, datamodule = BoringClassifier(), make_datamodule()
trainer.fit(module, datamodule=datamodule)
trainer.validate(module, datamodule=datamodule)
trainer.test(module, datamodule=datamodule)
print("done")
"""


def test_a_script_with_federated_trainer_prints_no_dependency_notices(tmp_path):
    """A Python user's first run (FederatedTrainer built, fitted, validated and tested in a script) is as quiet as
    the command's: no litlogger tip from the Trainer's construction, no LeafSpec deprecation from its loops."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)], env=env, capture_output=True, text=True, timeout=300
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "done" in done.stdout, output
    printed = {name: line for name, text in NOTICES.items() for line in output.splitlines() if text in line}
    assert printed == {}, output
