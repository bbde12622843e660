"""Examples of plugging your own strategies and protocols into fedrec-privacy."""
