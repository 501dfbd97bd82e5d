"""mlflow_rag_eval."""
