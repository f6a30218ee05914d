"""What a training program imports from mtc (the ``program`` extra: numpy and the standard
library only, nothing of the control plane): ``tiers`` saves and restores its state through
node memory, a peer node and durable storage; ``names`` holds the environment variables the
managed environment sets for it (imported by the compute adapters too, so it stays stdlib)."""
