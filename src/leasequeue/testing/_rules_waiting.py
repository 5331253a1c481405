from __future__ import annotations
from ._contract_base import ContractBase
class WaitingRules(ContractBase):
    pass
