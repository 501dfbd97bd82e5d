"""How an evaluation runs: the suite (what is measured), the engine (batches, the one owner of
metric failures), slices, and the result types an evaluation returns."""
