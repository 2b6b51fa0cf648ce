# qattn.models: real models to swap methods into (use_lite).
