"""Attack simulation: malicious clients that poison their data or their updates, for robustness experiments."""

from lightning_fed.attacks.label_flip import LabelFlip
from lightning_fed.attacks.malicious import ATTACKS, MaliciousClients
from lightning_fed.attacks.selection import choose_malicious, num_malicious

__all__ = ["ATTACKS", "LabelFlip", "MaliciousClients", "choose_malicious", "num_malicious"]
