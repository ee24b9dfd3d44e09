"""The collectors' framework: what a collector is and how it is declared (``base``), which steps each profiler owns
(``schedule``), the options a run's collectors are built with (``options``), and the child process a post-run
probe runs the user's code in (``probing``). The collectors themselves are in ``collect/collectors/``."""
