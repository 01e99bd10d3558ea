// Filled in by the CPU ops work.
