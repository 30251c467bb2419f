{{/*
The Secrets a webhook keeps its certificates in, made by the chart so that the component
needs no `create` on Secrets: `create` cannot be limited to a name, and in the component's
namespace it would let it make a service-account token Secret for any account there. Two
of them: the serving certificate with its key and the CA bundle (kubernetes.io/tls), and
the CA's certificate and key (Opaque), so that the key that signs for the webhook is not
where the serving pair is. Empty at first (the component fills them in); their data is
kept across upgrades.
Takes (dict "root" $ "name" <serving Secret> "caName" <CA Secret> "component" <component>).
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
---
{{- $existingCa := lookup "v1" "Secret" .root.Release.Namespace .caName }}
apiVersion: v1
kind: Secret
metadata:
  name: {{ .caName }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "kubeairunway-lib.labels" . | nindent 4 }}
type: Opaque
{{- if and $existingCa $existingCa.data }}
data:
  {{- toYaml $existingCa.data | nindent 2 }}
{{- end }}
{{- end -}}
