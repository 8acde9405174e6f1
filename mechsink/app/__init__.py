"""The faces: the ``mechsink`` command line (:mod:`mechsink.app.cli`) and sweeps over many
models, checkpoints and prompt pairs (:mod:`mechsink.app.sweep`)."""
