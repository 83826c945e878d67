"""Trainer service: one DDP rank per device, consuming its stream and its assignments."""
