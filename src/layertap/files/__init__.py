"""Files: the record of what an operation reads, checked and atomic writes, arrays saved to disk."""
