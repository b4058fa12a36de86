"""What is known about CUDA, gcc, torch, flash-attn and GPUs: the data files with their sources, and their typed
readers.
"""

# The wing's face: what other wings and the entry may import from it, as module or module.name (tests/test_wings.py
# holds every import across wings to this list and every entry to a use).
PUBLIC = (
    "archs.ArchCoverage",
    "archs.FatbinEntry",
    "archs.compiled_entries",
    "archs.fatbin_entries",
    "fa3_pins",
    "fa4_pins",
    "fa4_pins.DEFAULT_RELEASE",
    "fa4_pins.DSL_PACKAGES",
    "fa4_pins.KNOWLEDGE_FILE",
    "fa4_pins.Release",
    "fa4_pins.WheelPin",
    "fa4_pins.knowledge",
    "fa4_pins.release",
    "fa4_pins.wheel_fits_python",
    "facts.Knowledge",
    "facts.PypiCuda",
    "facts.PypiLine",
    "facts.arch_number",
    "facts.load_knowledge",
    "facts.minor_of",
    "files",
    "files.KNOWLEDGE_DIR",
    "frameworks.FILE",
    "frameworks.verl",
    "nvcc_gcc.gcc_cap",
    "nvcc_gcc.host_config_cap",
    "nvcc_gcc.lines_accepting",
    "object_costs.CostKey",
    "object_costs.KNOWLEDGE_NAME",
    "object_costs.load_object_costs",
    "upstream.register",
)
