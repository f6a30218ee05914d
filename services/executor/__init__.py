"""The compute executor: applies the cloud control plane's compute requests beside the machines."""
