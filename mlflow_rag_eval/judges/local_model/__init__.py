"""The embedded judge's model: the sentence encoder (:mod:`.embedding`), the support model and
its shipped weights (:mod:`.support_model`), its training (:mod:`.training`) and the synthetic
corruptions it trains on (:mod:`.corruptions`)."""
