"""Metrics of other libraries behind our metric interface and our judge: ``ragas:<name>`` and
``deepeval:<name>``. Each module imports its library only when such a name is resolved."""
