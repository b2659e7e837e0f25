"""The storage layer: store access, local and S3 backends, catalog reads, the writer, chunk reads."""
