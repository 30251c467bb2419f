{{/*
The Secret a webhook keeps its CA and serving certificate in, made by the chart so that the
component needs no `create` on Secrets: `create` cannot be limited to a name, and in the
component's namespace it would let it make a service-account token Secret for any account
there. Empty at first (the component fills it in); its data is kept across upgrades.
Takes (dict "root" $ "name" <Secret name> "component" <component>).
*/}}
{{- define "kubeairunway-lib.webhookSecret" -}}
{{- $existing := lookup "v1" "Secret" .root.Release.Namespace .name }}
apiVersion: v1
kind: Secret
metadata:
  name: {{ .name }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "kubeairunway-lib.labels" . | nindent 4 }}
type: kubernetes.io/tls
data:
  {{- if and $existing $existing.data }}
  {{- toYaml $existing.data | nindent 2 }}
  {{- else }}
  tls.crt: ""
  tls.key: ""
  {{- end }}
{{- end -}}
