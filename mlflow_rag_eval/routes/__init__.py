"""How users call us from MLflow: the ``rag`` evaluator plugin (:mod:`.evaluator`),
``extra_metrics`` for the default evaluator (:mod:`.extra_metrics`) and scorers for
``mlflow.genai.evaluate`` (:mod:`.scorers`)."""
