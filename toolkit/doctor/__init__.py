"""`toolkit doctor`: the facts gathered once, the rows judged from them.
"""
