"""Optional bridges between ragdot and other frameworks; import the submodule you need.

    import ragdot.integrations.transformers as rt
    rt.register()                     # experts_implementation="ragdot" in Hugging Face transformers

    import ragdot.integrations.torchtitan as tt
    tt.patch()                        # torchtitan's GroupedExperts._grouped_mm runs ragdot

Nothing here is imported by ``import ragdot``, and nothing here imports a framework until its submodule is used.
"""
