"""A site's view of many lines: HPC modulefiles, the matrix, Slurm and local scale-out.
"""
