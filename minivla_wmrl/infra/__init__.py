"""What every command stands on: typed settings, atomic files and output directories, run
checkpoints and metrics logs, recorded versions, and the torch.distributed / FSDP plumbing."""
