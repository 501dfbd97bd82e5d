"""MLflow I/O: searching runs, versions and calibrations (:mod:`.search`), logging an evaluation
to its run (:mod:`.run_logging`), rows as traces with assessments (:mod:`.traces`), and the spans
of a traced pipeline (:mod:`.pipeline_traces`)."""
