"""Examples: sentence pairs (SOP/NSP), whole-word n-gram masks, the batch layout and the stored records."""
