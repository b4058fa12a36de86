module_version("flash-attn/2.8.3.post2-cu130-torch2.11-py<XY>", "default")
