"""What is known about CUDA, gcc, torch, flash-attn and GPUs: the data files with their sources, and their typed
readers.
"""
