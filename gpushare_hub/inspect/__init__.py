"""`kubectl inspect gpushare`: who holds which slice of which card, as a terminal table or JSON.

The tables keep the columns and layout of Aliyun's ``kubectl-inspect-gpushare`` so that
admins migrating from it read the same thing; the numbers come from the shared ledger.
"""
