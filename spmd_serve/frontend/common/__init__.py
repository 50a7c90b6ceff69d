"""What every protocol of the front end shares: the refusal and limits every parser uses
(`parsing`), the tornado base handler of every POST endpoint (`http_base`), one engine request
seen from the IO loop (`generation`), and the liveness/readiness rules (`liveness`).

Imports only from `frontend.text`, the engine client and `sampling_params`: never a protocol
package (native, openai, triton) and never `frontend.server`.
"""
