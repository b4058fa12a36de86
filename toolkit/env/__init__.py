"""A line's environment: the lock (conda and pip layers, FA4's wheels), the engines that solve and install it,
the install record.
"""
