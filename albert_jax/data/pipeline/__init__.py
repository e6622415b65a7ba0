"""The loader: a prepared dataset's records -> pairs per epoch, weighted sources -> masked batches (grain)."""
