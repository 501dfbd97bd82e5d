"""The judge against human labels: labels files and HUMAN feedback on traces (:mod:`.labels`),
calibration records (:mod:`.calibrate`), PPI++ estimates on runs (:mod:`.ppi`)."""
