"""Readers of other tools' model and job descriptions: HuggingFace ``config.json``
(:mod:`.hf`), Megatron-LM argument lists (:mod:`.megatron`) and torchtitan job files
(:mod:`.torchtitan`). Each maps what it can onto simtrain's ModelSpec / ParallelConfig fields and
says what it left out."""
