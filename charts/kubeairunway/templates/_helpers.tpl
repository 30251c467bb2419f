{{/* Names of the core chart's objects; labels, the image and the pod come from the
library chart (kubeairunway-lib), with the context
(dict "root" $ "values" .Values "component" "controller" "name" <fullname> "lease" <fullname>). */}}
{{- define "kubeairunway.fullname" -}}
{{- include "kubeairunway-lib.fullname" . -}}
{{- end -}}

{{- define "kubeairunway.webhookService" -}}
{{- printf "%s-webhook" (include "kubeairunway.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kubeairunway.webhookSecret" -}}
{{- printf "%s-webhook-tls" (include "kubeairunway.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kubeairunway.webhookCaSecret" -}}
{{- printf "%s-webhook-ca" (include "kubeairunway.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kubeairunway.validatingWebhook" -}}
{{- printf "%s-validating" (include "kubeairunway.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kubeairunway.mutatingWebhook" -}}
{{- printf "%s-mutating" (include "kubeairunway.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
