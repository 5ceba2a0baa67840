"""The smallest YAML a CLI test starts from: one round of the MNIST-1D classifier, its logger to fill in."""

BASE = """\
seed_everything: 0
trainer:
  num_rounds: 1
  clients_per_round: 2
  local_epochs: 1
  accelerator: cpu
  devices: 1
  logger: {logger}
  enable_progress_bar: false
  enable_model_summary: false
model:
  class_path: lightning_fed.models.ClassifierModule
  init_args:
    backbone:
      class_path: lightning_fed.models.MNIST1DCNN
      init_args:
        num_classes: 10
    num_classes: 10
    lr: 0.05
data:
  class_path: lightning_fed.datamodules.MNIST1DFederated
  init_args:
    partitioner:
      class_path: lightning_fed.datamodules.DirichletPartitioner
      init_args:
        num_partitions: 2
        alpha: 0.5
        seed: 0
    num_samples: 200
    batch_size: 32
"""

__all__ = ["BASE"]
