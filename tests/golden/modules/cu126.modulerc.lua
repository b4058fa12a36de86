module_version("flash-attn/2.8.3.post2-cu126-torch2.9-py312", "default")
