"""One module per judge scheme (``local``, ``openai``, ``bedrock``, ``endpoints``, ``llamacpp``,
``scripted``, ``panel``), each imported by the registry when its scheme is first used."""
