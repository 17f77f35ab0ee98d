"""Settings: ``base`` reads everything from the environment; ``dev``, ``test`` and
``production`` only choose defaults and checks."""
