"""verl's own dump directories: safe reading (no pickle code run), writing, import and export."""
