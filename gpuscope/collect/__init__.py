"""The first stage: running the user's script (``runner``) under the collectors (``collect/collectors/``), which turn what
they see into payloads (``captures``) and artifacts. Nothing here reads a later stage."""
