"""`make demo`: the scenario (`scenario`), its run on a simulated cluster (`run`) and the report."""
