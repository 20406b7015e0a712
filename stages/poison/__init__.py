"""Messages that kill their processor: the processor's blame record and the
producer's guard (strikes, suspects run alone, quarantine).
"""
