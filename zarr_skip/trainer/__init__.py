"""The trainer face: the SkipManager, its verl-compatible configuration and uid remapping."""
